# Issues 19, 20 (twenty-fourth session), sixth call: the final tree (TREE, the review's refactors of the judge) on the
# GPU: the gate's tests, then the red team.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; date -u; cat .carry/S24/TREE
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_gate.py > $OUT/c6_gate.txt 2>&1
echo "gate: rc $? in $(( $(date +%s) - T )) s"; tail -n 2 $OUT/c6_gate.txt | cut -c1-300
T=$(date +%s)
CUDA_VISIBLE_DEVICES=0 DRKERNEL_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py tests/test_precision.py > $OUT/c6_redteam.txt 2>&1
echo "red team: rc $? in $(( $(date +%s) - T )) s"; tail -n 3 $OUT/c6_redteam.txt | cut -c1-300; date -u
