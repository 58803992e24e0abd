"""What can be checked of a kernel binary without running it: on CPU, that it is an ELF object whose entry (where the CPU runtime jumps:
offset 0 of its first loaded section) is a function named as its program.

tinygrad 0.14.0's CPU runtime (runtime/ops_cpu.py `CPUProgram`) executes a binary that lacks the ELF magic as raw machine code, and
otherwise loads it with runtime/support/elf.py `jit_loader`: the PROGBITS sections laid out in order, relocations applied, a call to
offset 0. So bytes that are not such an ELF, or an ELF of another kernel, would run as code. The code inside a well-formed ELF is not
checkable: a bundle is data, but its kernels are code for the named device.
"""
from __future__ import annotations

import struct

ELF_MAGIC = b"\x7fELF"
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr (little endian)
SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, addralign, entsize
SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
SHT_PROGBITS, SHT_SYMTAB = 1, 2
STT_FUNC = 2

class BinaryError(ValueError):
  """A kernel binary that cannot be the program it is stored as."""

def _cstr(table: bytes, at: int) -> str:
  end = table.find(b"\x00", at)
  if not 0 <= at < len(table) or end < 0: raise BinaryError(f"a name offset {at} outside its string table")
  return table[at:end].decode("utf-8", "replace")

def elf_functions(lib: bytes) -> tuple[int | None, dict[str, tuple[int, int]]]:
  """(index of the first PROGBITS section, {function symbol: (section index, value)}) of a little-endian ELF64 object; every table read
  is checked to lie inside `lib`."""
  if len(lib) < EHDR.size or lib[:4] != ELF_MAGIC: raise BinaryError("not an ELF object (no ELF magic)")
  if lib[4] != 2 or lib[5] != 1: raise BinaryError("not a little-endian 64-bit ELF object")
  *_, shoff, _, _, _, _, shentsize, shnum, _ = EHDR.unpack_from(lib)
  if shentsize != SHDR.size or not 0 < shnum <= 4096 or shoff + shnum * SHDR.size > len(lib): raise BinaryError("section headers outside the binary")
  sections = [SHDR.unpack_from(lib, shoff + i * SHDR.size) for i in range(shnum)]
  for _, kind, _, _, offset, size, *_ in sections:
    if kind != 8 and offset + size > len(lib): raise BinaryError("a section runs past the end of the binary")  # 8: SHT_NOBITS holds no bytes
  first = next((i for i, s in enumerate(sections) if s[1] == SHT_PROGBITS), None)
  functions = {}
  for _, kind, _, _, offset, size, link, _, _, entsize in sections:
    if kind != SHT_SYMTAB: continue
    if entsize != SYM.size or not 0 <= link < shnum: raise BinaryError("a malformed symbol table")
    names = lib[sections[link][4]:sections[link][4] + sections[link][5]]
    for at in range(offset, offset + size - SYM.size + 1, SYM.size):
      name, info, _, shndx, value, _ = SYM.unpack_from(lib, at)
      if info & 0xF == STT_FUNC: functions[_cstr(names, name)] = (shndx, value)
  return first, functions

def check_kernel_binary(lib: bytes, name: str, device: str) -> None:
  """Raise BinaryError unless `lib` can be the program `name` for `device` (a device kind: CPU, CUDA, ...). Only CPU binaries have a
  checkable entry point; other devices look a kernel up by name in their driver, which fails with an error, not a jump."""
  if device != "CPU": return
  first, functions = elf_functions(lib)
  if name not in functions: raise BinaryError(f"the binary defines no function {name!r} (it has {sorted(functions)[:4]})")
  if functions[name] != (first, 0): raise BinaryError(f"function {name!r} is not at the binary's entry point, where the CPU runtime calls")
