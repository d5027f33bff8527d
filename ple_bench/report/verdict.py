"""The verdict rule moved to :mod:`ple_bench.verdict` (a domain module beside ``record``); this name
stays an alias of that one module, so older imports keep working."""

import sys

from .. import verdict as _verdict

sys.modules[__name__] = _verdict
