"""Where we touch a dependency's internals: one module per dependency, each behind a version gate.

The lowest layer: these modules import only third-party code (and ``compat.gate``). Each one
names the versions it was read against (``GATE``); tests/compat/test_compat.py fails on any other
installed version, and at run time an untested version logs one warning (or, where a public
path exists, takes it). docs/compat.md lists what each module reaches into and why.
"""
