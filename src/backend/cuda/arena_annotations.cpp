#include "backend/cuda/arena_annotations.h"

#include <nvtx3/nvToolsExtMem.h>

namespace ptrain {

struct ArenaAnnotations::Handles {
  nvtxDomainHandle_t domain = nullptr;
  nvtxMemHeapHandle_t heap = nullptr;
};

ArenaAnnotations::ArenaAnnotations(const void* base, size_t bytes) : handles_(std::make_unique<Handles>()) {
  handles_->domain = nvtxDomainCreateA("ptrain");
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes;
  range.ptr = base;
  nvtxMemHeapDesc_t heap{};
  heap.extCompatID = NVTX_EXT_COMPATID_MEM;
  heap.structSize = sizeof(heap);
  heap.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  heap.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  heap.typeSpecificDescSize = sizeof(range);
  heap.typeSpecificDesc = &range;
  handles_->heap = nvtxMemHeapRegister(handles_->domain, &heap);
}

ArenaAnnotations::~ArenaAnnotations() {
  if (handles_->heap) nvtxMemHeapUnregister(handles_->domain, handles_->heap);
  if (handles_->domain) nvtxDomainDestroy(handles_->domain);
}

void ArenaAnnotations::allocated(const void* block, size_t bytes) {
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes;
  range.ptr = block;
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = handles_->heap;
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemRegionsRegister(handles_->domain, &batch);
}

void ArenaAnnotations::shrink(const void* block, size_t bytes_asked_for) {
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes_asked_for;
  range.ptr = block;
  nvtxMemRegionsResizeBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.regionDescCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  nvtxMemRegionsResize(handles_->domain, &batch);
}

void ArenaAnnotations::released(const void* block) {
  nvtxMemRegionRef_t ref{};
  ref.pointer = block;
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(handles_->domain, &batch);
}

}  // namespace ptrain
