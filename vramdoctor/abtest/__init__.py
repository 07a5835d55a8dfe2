"""`vramdoctor ab-test`: every memory mitigation for a model's GPU image processor, measured.

workload (seeded images) -> runner (one worker process per variant, records streamed to the
run file) -> analysis (pure, over the records) -> report. The IPC arm measures the CUDA IPC
device redirect across GPUs. torch is only imported inside worker processes.
"""

# A namespace of modules: import what you need from them (e.g. vramdoctor.sources.nvml).
__all__: list[str] = []
