"""Benchmarks of the runtime against the legacy pickled TinyJits and peers. Run from the repo root: python -m benchmarks.bench --help"""
