# Session 53, calls 4 and 5 in one start: `exp/s53_call4.sh`, then `exp/s53_call5.sh`.
bash exp/s53_call4.sh
bash exp/s53_call5.sh
