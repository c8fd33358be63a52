"""What the sparse attention implementations share, on every platform, one module per job.

- `masks`: `SparseMask`, the canonical block-sparse mask (`canonical_sparse_mask`), and
  `position_allowed`, the positional rules on a tile;
- `block_table`: `BlockTable` and `build_block_table`, the key blocks each query block visits (and back),
  and `row_intervals`;
- `checked_call`: `BlockSparseCall`, a checked block-sparse call (`blocksparse_call`), and
  `padded_mask_operands`;
- `native_sparse`: native sparse attention's packing, compressed branch, block selection
  (`native_selection`), sliding-window branch and gating.
"""
