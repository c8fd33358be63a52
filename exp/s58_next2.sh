# Prepared in session 58 for the next session (one H200, about 3 minutes; carry [".whl"]), on main: the dense gated
# delta rule's one-pass forward below 256 (batch row, head) programs (`s58_one_pass_rows.py`): if it wins at 128 or 64
# rows, `_delta.one_pass_outputs`'s threshold moves there.
. exp/s28_env.sh
(cd exp && timeout 240 python3 s58_one_pass_rows.py 2>&1 | quiet | tail -6)
