"""rome's measurements: speed, kernels per call, memory and precision reports (``make report``)."""
