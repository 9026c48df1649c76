// CUDA quant kernels vs the CPU reference (owned by the quant work; filled in this session).
