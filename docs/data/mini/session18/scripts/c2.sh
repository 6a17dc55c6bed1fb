# call 2: the third chunk, unpacked beside and moved in whole (the daemon waits for the file); then watch
python3 benchmarks/bundle.py add .carry/G3/bundle-*-3of3 --unpack /tmp/unpack || exit 1
[ -d .carry/S18ck ] && cp .carry/S18ck/* /tmp/state/
mv /tmp/unpack/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/state/ && ls -la /tmp/state
bash /tmp/repo/.carry/S18/watch.sh ${1:-420}
