"""sunnypilot modeld_v2 native artifacts. Importing the package registers openpilot's rules with the bundle reader, which knows none of
them (bundle_rules.py)."""
from sunnypilot.modeld_v2 import bundle_rules

bundle_rules.register()
