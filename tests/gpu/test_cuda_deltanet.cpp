// CUDA deltanet kernels vs the CPU reference (owned by the deltanet work; filled in this session).
