# Session 53, calls 4 and 5 in one start (little device time left): `exp/s53_call4.sh`, then as much of
# `exp/s53_call5.sh` as 110 seconds allow.
bash exp/s53_call4.sh
timeout 110 bash exp/s53_call5.sh
