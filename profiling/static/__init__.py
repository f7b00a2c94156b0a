"""The GPU kernels compiled ahead of time, on any machine (no GPU needed), and read: ``python -m
profiling kernels`` (docs/kernels.md).

For every configuration the launcher can choose (``rome.launch.kernel_configs(arch)``) and every
arch asked for, the kernel is compiled with the specialisation a real launch gets and its cubin
(AMD: code object) read: registers, spills, shared memory, occupancy, the instructions of one
tile; NVIDIA builds also go through a static bandwidth model. ``--workload NAME`` does the same
for just the launches one workload's rome variants make. One module per idea, each importing
only those listed before it:

- ``archs``: per-arch limits (NVIDIA per SM, AMD per CU), the occupancy they allow, ``parse_arch``.
- ``nvidia``: reading a cubin with cuobjdump (``-res-usage``, SASS: instruction counts, tile loops).
- ``amd``: reading an AMD code object (``.amdgpu_metadata``, LLVM's comments); the AMD method text.
- ``compile``: the ahead-of-time compile (``ast_source``, ``compile_kernel``) in worker processes
  that never saw ``TRITON_INTERPRET=1`` (``compiler_pool``); ``Job``, one compile and its reading.
- ``schedule``: a launch's programs scheduled on its slowest SM from the SASS (a program's path, what
  each load reads, four warp schedulers and one L1 path at a fixed DRAM latency).
- ``model``: the static bandwidth model (the schedule at both latency ends and clocks against copy,
  one tile's figures, the bounds per GPU).
- ``configs``: every configuration compiled for every arch, one row each (``collect``).
- ``launches``: one workload's launches, captured and compiled, each with the model
  (``collect_workload``).
- ``tables``: the markdown tables, ``kernels.json``/``kernels.md``, the report's kernels section.
- ``cli``: ``python -m profiling kernels`` (``add_arguments``, ``main``) and ``report_section``
  for ``make report``.
"""
