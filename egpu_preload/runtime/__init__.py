"""The in-process runtime: what libegpu_shim.so calls inside the instrumented application.

hooks: the entry points the shim's C code calls (egpu_shim.h part 1) and the instrumenter registry.
"""
