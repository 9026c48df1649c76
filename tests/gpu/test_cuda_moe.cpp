// CUDA moe kernels vs the CPU reference (owned by the moe work; filled in this session).
