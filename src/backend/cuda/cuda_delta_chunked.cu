// (being written this session)
#include "backend/cuda/cuda_ops.cuh"
