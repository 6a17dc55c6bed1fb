# call 2: the third chunk, unpacked beside and moved in whole (the daemon waits for the file); for lease 16 the
# checkpoint bundle's last piece, unpacked into /tmp/ckin (the daemon waits for it); then watch
. .carry/S20/pre.sh
python3 benchmarks/bundle.py add .carry/G3/bundle-*-3of3 --unpack /tmp/unpack || exit 1
mv /tmp/unpack/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/state/ && ls -la /tmp/state
if [ -d .carry/S20ck ]; then
  python3 benchmarks/bundle.py add .carry/S20ck/bundle-* --store /tmp/ckstore --unpack /tmp/ckin.part || exit 1
  mv /tmp/ckin.part /tmp/ckin && ls -laR /tmp/ckin | head -20
fi
bash /tmp/repo/.carry/S20/watch.sh ${1:-420}
