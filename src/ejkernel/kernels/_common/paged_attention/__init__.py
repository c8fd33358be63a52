"""What the six serving ops share: one ragged, paged attention problem and the code every platform needs.

`page_attention`, `prefill_page_attention`, `ragged_page_attention_v2/v3`, `ragged_decode_attention` and
`unified_attention` are one computation. Each sequence `s` owns a list of cache pages (a row of its page
table) holding its `kv_len[s]` keys and values; its `q_len[s]` queries are the LAST `q_len[s]` positions
of that context (query `j` sits at position `kv_len - q_len + j`) and attend causally over its keys. The
ops differ only in how they lay out queries, pages and options; each op's arguments become one
`PagedBatch`, which every platform's core reads. The modules, one job each:

- `problem`: the canonical problem (`PagedBatch`, its static part `PagedStatic`, the cache addressing `CacheRows`);
- `arguments`: the checks the public functions run on their arguments (shapes, dtypes, options, index values);
- `adapters`: each op's arguments -> a `PagedBatch` (`*_batch`), clamping index values to one meaning;
- `kv_cache`: the caches the ops write (`ragged_page_attention_v3`'s packed layout, where new tokens go);
- `core_math`: the math every core shares (query tiles, key spans, logit biases and masks, online softmax,
  the merge of splits);
- `tiles`: what the kernels share: query rows in, partial sums out;
- `jax_core`: the plain-JAX core, which serves the XLA platform and gives the kernels their backward;
- `implementations`: each op's signature around a platform's core, and the tiling a config asks for;
- `cascade`: `cascade_attention` on any core (the shared prefix as one more batch, joined by log-sum-exp).
"""
