"""Upstream's module path for `MaskInfo` and the mask helpers (`ejkernel.types.mask`)."""

from ejkernel.types.mask_arrays import mask_to_segment_ids, segment_ids_to_mask, segment_ids_to_qkv_masks
from ejkernel.types.mask_info import MaskInfo

__all__ = ["MaskInfo", "mask_to_segment_ids", "segment_ids_to_mask", "segment_ids_to_qkv_masks"]
