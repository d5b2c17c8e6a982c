/* A stand-in for cuda.h: the one type the fake CUPTI header needs. */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H
typedef struct CUctx_st *CUcontext;
#endif
