"""The one module on the PYTHONPATH egpu-run gives its job (job.job_env): a stand-in for _cffi_backend that
hands over the job's own, else egpu's.

cffi's embedding imports _cffi_backend when the shim starts Python, before any of egpu's code runs, so it
must be found on the job's path; egpu's import directories there would come before the job's own
site-packages and change its imports. This module, found instead, takes its directory off sys.path and
itself out of sys.modules, then imports the _cffi_backend the job's path has (the job's cffi needs its
own: cffi refuses a backend of another version), else the one in egpu's directories (EGPU_IMPORT_DIRS),
without adding them to sys.path: the shim's start-up code does that, after the job's own (shim/build.py).
A Python of another version than egpu's finds none there (the file names its ABI), as without egpu.
"""

import importlib
import os
import sys
from importlib.machinery import PathFinder
from importlib.util import module_from_spec

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
del sys.modules[__name__]
try:
    _real = importlib.import_module(__name__)
except ImportError:
    _spec = PathFinder.find_spec(__name__, [d for d in os.environ.get("EGPU_IMPORT_DIRS", "").split(os.pathsep) if d])
    if _spec is None:
        raise
    _real = module_from_spec(_spec)
    _spec.loader.exec_module(_real)
sys.modules[__name__] = _real   # what the import statement that found this module returns
