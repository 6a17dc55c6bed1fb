# call 2: the second chunk, unpacked beside and moved in whole (the daemon waits for the file), then watch
python3 benchmarks/bundle.py add .carry/G/bundle-*-2of2 --unpack /tmp/unpack || exit 1
mv /tmp/unpack/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/state/ && ls -la /tmp/state
bash /tmp/repo/.carry/S15/watch.sh ${1:-540}
