"""The head-group kernel's chosen launches (no autotuner candidates) whose batch depth, register
cap or rows 4e32371 changed off sm_90: sm_100 bf16 and fp16, sm_80 fp16; head_dim 64, 128, 256;
every pass, product, tables/positions kind and norm row."""
from rome.launcher import kernel_configs
from rome import kernel


def configs(cc=None):
    dtypes = ("bf16", "fp16") if cc == 100 else ("fp16",)
    return [c for c in kernel_configs(cc) if c.fn is kernel._rome_gather_kernel and not c.meta.get("tuned_candidate")
            and c.meta["x_dtype"] in dtypes and c.meta["head_dim"] in (64, 128, 256)]
