# lease B's call 2: the second chunk and lease A's recipe adapter (.carry/S13B), then watch
python3 benchmarks/bundle.py add .carry/G/bundle-*-2of2 --unpack /tmp/unpack || exit 1
mv /tmp/unpack/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/state/ && ls -la /tmp/state
cp -r .carry/S13B /tmp/state/S13B && touch /tmp/state/S13B.ok
bash /tmp/repo/.carry/S13/watch.sh ${1:-540}
