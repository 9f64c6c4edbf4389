"""Scores result.json: turns done / turns planned; 0 without a readable file."""
import json
import os

passed, total = 0, 1
try:
    with open("result.json") as f:
        data = json.load(f)
    planned, done = int(data["turns_planned"]), int(data["turns_done"])
    if planned >= 1:
        passed, total = max(0, min(done, planned)), planned
except (OSError, ValueError, KeyError, TypeError):
    pass
with open(os.path.join(os.environ["GYRE_REWARD_DIR"], "reward.json"), "w") as f:
    json.dump({"passed": passed, "total": total}, f)
