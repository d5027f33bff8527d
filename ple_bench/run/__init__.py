"""A case's trip from the suite loop to its record: ``loop`` (order, dispatch, derive, write, resume),
``dispatch`` (one ``run_case``: ple_bench's worker pool or this process under torchrun), ``pool`` (the
worker processes), ``torchrun`` (the ranks' agreement and recovery), ``rank`` (one rank's start),
``outcome`` (how a case ends, as a status), ``executor`` (a lookup case), ``step`` (a decode-step case),
``graphs`` (the breakable CUDA graph), ``provenance`` (the run's ``meta.json``)."""
