//! The emulated libmusa answers with the numbers libgdrapi and the tools expect: one source of
//! MUSA's ids (`gdrapi::musa::ids`), which the emulator, the other side of the interface, is
//! held to here.

use gdrapi::musa::ids as expected;
use mtgpu_emu_musa as musa;

#[test]
fn the_emulators_ids_are_libgdrapis() {
    let pairs = [
        (musa::MUSA_SUCCESS, expected::MUSA_SUCCESS),
        (
            musa::MUSA_ERROR_INVALID_VALUE,
            expected::MUSA_ERROR_INVALID_VALUE,
        ),
        (
            musa::MUSA_ERROR_OUT_OF_MEMORY,
            expected::MUSA_ERROR_OUT_OF_MEMORY,
        ),
        (
            musa::MUSA_ERROR_NOT_INITIALIZED,
            expected::MUSA_ERROR_NOT_INITIALIZED,
        ),
        (musa::MUSA_ERROR_NO_DEVICE, expected::MUSA_ERROR_NO_DEVICE),
        (
            musa::MUSA_ERROR_INVALID_DEVICE,
            expected::MUSA_ERROR_INVALID_DEVICE,
        ),
        (
            musa::MUSA_ERROR_INVALID_CONTEXT,
            expected::MUSA_ERROR_INVALID_CONTEXT,
        ),
        (
            musa::MUSA_ERROR_OPERATING_SYSTEM,
            expected::MUSA_ERROR_OPERATING_SYSTEM,
        ),
        (musa::MUSA_ERROR_NOT_FOUND, expected::MUSA_ERROR_NOT_FOUND),
        (
            musa::MUSA_ERROR_NOT_SUPPORTED,
            expected::MUSA_ERROR_NOT_SUPPORTED,
        ),
        (musa::MUSA_ERROR_UNKNOWN, expected::MUSA_ERROR_UNKNOWN),
        (
            musa::MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
            expected::MU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
        ),
        (
            musa::MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            expected::MU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
        ),
        (
            musa::MU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            expected::MU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
        ),
    ];
    let vmm = [
        (
            musa::vmm::MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED,
            expected::MU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_MUSA_VMM_SUPPORTED,
        ),
        (
            musa::vmm::MU_MEM_ALLOCATION_TYPE_PINNED,
            expected::MU_MEM_ALLOCATION_TYPE_PINNED,
        ),
        (
            musa::vmm::MU_MEM_LOCATION_TYPE_DEVICE,
            expected::MU_MEM_LOCATION_TYPE_DEVICE,
        ),
        (
            musa::vmm::MU_MEM_ALLOC_GRANULARITY_MINIMUM,
            expected::MU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ),
        (
            musa::vmm::MU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            expected::MU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        ),
    ];
    let pairs: Vec<_> = pairs.iter().chain(&vmm).collect();
    for (i, (emulator, library)) in pairs.iter().enumerate() {
        assert_eq!(emulator, library, "pair {i}");
    }
    assert_eq!(musa::MU_MEM_ATTACH_GLOBAL, expected::MU_MEM_ATTACH_GLOBAL);
    assert_eq!(musa::MU_MEM_ATTACH_HOST, expected::MU_MEM_ATTACH_HOST);
}
