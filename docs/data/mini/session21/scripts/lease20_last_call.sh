# Lease 20's last call (2026-11-26 21:34:50-21:41:45 UTC), on the machine that had just packed steps 1-28: the
# daemon of the planned lease 21 (.carry/S21B, `lease.py call .carry/S21B 1 --lease-s 600`) had found the machine
# still warm, skipped base and SFT (done) and was waiting for the checkpoint's pieces. Two calls before this one,
# meant to stop it with `pkill -f`, killed themselves (the pattern matched their own command line; the first took the
# daemon with it, so this one found none). This call ran the last two steps (resumed from checkpoint-28, still on
# the machine) and the test-split bench in place.
D=$(pgrep -f "^[^ ]*python[0-9.]* /tmp/repo/benchmarks/lease.py daemon"); echo "daemon $D"; [ -n "$D" ] && kill -- -$D; sleep 3
cd /tmp/repo && export PYTHONPATH=/tmp/repo:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ls /tmp/mini/rl/recipe-s2 | head; python3 -c "import json; print(json.load(open('/tmp/mini/sft/sft_summary.json'))['weights_sha256'])"; date -u
timeout 540 python3 benchmarks/miniature.py --root /tmp/mini --base /tmp/state/SmolLM2-135M-Instruct.Q4_1.gguf rl bench --gpus 1 \
    --policies recipe-s2 --rl-set num_generations=4 --rl-set per_device_train_batch_size=8 --rl-set gradient_accumulation_steps=2 \
    --rl-set max_steps=30 --time-limit-s 525 2>&1 | grep -v "^.pool." | tail -n 15; date -u
sha256sum /tmp/mini/rl/recipe-s2/final/adapter_model.safetensors
cd /tmp/mini && tar -czf $OUT/runsB.tgz --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.bin' --exclude='*.pt' rl bench logs sft/sft_summary.json lease.log 2>/dev/null
[ -d rl/recipe-s2/final ] && tar -czf $OUT/adapter.tgz -C rl/recipe-s2/final .; ls -la $OUT
