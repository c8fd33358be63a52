# Prepared in session 59 for the next session (one H200, about 6 minutes; carry [".whl"]), on main: where GLA's
# forward+backward spends its time now that its state passes take four chunks a step (5.45-5.48 ms against fla's
# 6.15; issue 42's target 4.9), then its state passes on other tiles (`s59_gla_tiles.py`).
. exp/s28_env.sh
(cd exp && timeout 120 python3 s56_gla_parts.py 2>&1 | quiet | tail -30)
(cd exp && timeout 300 python3 s59_gla_tiles.py 2>&1 | quiet | tail -8)
