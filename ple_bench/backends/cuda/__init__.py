"""The CUDA plumbing the lookup paths stand on, knowing nothing of a backend or a benchmark:
``cudart`` (the runtime through ctypes: raw events, raw copies, function addresses), ``green``
(green-context streams for the ``sm_limit`` axis), ``uva`` (a CUDA view of pinned host memory),
``host_alloc`` (how a pinned table's host memory is allocated and what it costs) and ``native``
(the C++ host gather, built on first use)."""
