"""The baseline profile of a captured graph: where one call's time goes, kernel by kernel.

    baseline.py   profile_graph(s): runs the worker in the sandbox, summarizes its samples (Profile)
    worker.py     `python -m tilesmith.profile.worker`: runs the wrapper, records each launch, times the kernels
    proxy.py      stand-ins for a wrapper's kernels that hand every launch to one function (the worker's and the
                  agent's kernel bench's)
    roofline.py   the device's ceilings and the roofline class of a kernel and of a graph

Nothing is imported here: the worker starts without the deciding side's modules.
"""
