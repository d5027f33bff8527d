"""The ``advise`` verb: which storage path to use for a given table, from stored runs (``answer``), a
fitted cost model (``model``, ``what_if``), a functional self-run when no run is given (``self_run``)
and the answer as a page (``html``)."""
