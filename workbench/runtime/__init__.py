"""The runtime: the session document, the worker process that holds the dispatched model, the
load / infer / verify jobs, and telemetry. No widgets, no Qt.

- ``session.Session``: the document (source, device map, budgets, profile), plain callbacks.
- ``worker.WorkerHost``: spawns the worker, sends ``protocol`` requests, delivers events.
- ``jobs.JobRunner``: the same jobs in process (CLI ``--in-process``) and in the worker.
- ``telemetry``: ``RingBuffer``, ``MemorySampler``, ``TransferRecorder`` and histories.

Submodules are imported explicitly (``from workbench.runtime.worker import WorkerHost``), so
importing this package costs nothing.
"""
