// CUDA attention kernels vs the CPU reference (owned by the attention work; filled in this session).
