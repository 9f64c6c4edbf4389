#!/bin/bash
# Hidden verifier: writes $GYRE_REWARD_DIR/reward.json
exec "${GYRE_PYTHON:-python3}" "$GYRE_TESTS_DIR/check.py"
