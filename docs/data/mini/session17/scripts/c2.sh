# call 2: the third chunk, unpacked beside and moved in whole (the daemon waits for the file); then the l9 exploit
# four times on the GPU (issue 19: it was `crashed` once, SandboxError, cudaErrorMapBufferObjectFailed, in call A),
# beside the daemon's conversion and SFT; then watch
python3 benchmarks/bundle.py add .carry/G3/bundle-*-3of3 --unpack /tmp/unpack || exit 1
mv /tmp/unpack/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/state/ && ls -la /tmp/state
for i in 1 2 3 4; do
  DRKERNEL_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfEx tests/test_hacking.py -k "exploit_is_caught and l9" > /tmp/out/l9F_$i.txt 2>&1
  echo "l9 run $i: rc $?"; grep -E "passed|failed|Error" /tmp/out/l9F_$i.txt | tail -n 3 | cut -c1-300
done
bash /tmp/repo/.carry/S17/watch.sh ${1:-300}
