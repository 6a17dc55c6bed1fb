# call 1b: the GGUF's second chunk of three (and, for lease 14, a piece of lease 13's checkpoint)
python3 benchmarks/bundle.py add .carry/G3/bundle-*-2of3 || exit 1
[ -d .carry/S18ck ] && cp .carry/S18ck/* /tmp/state/
tail -n 8 /tmp/mini/lease.log
