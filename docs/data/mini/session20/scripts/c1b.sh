# call 1b: the GGUF's second chunk of three (and, for lease 16, a piece of lease 15's checkpoint bundle)
. .carry/S20/pre.sh
python3 benchmarks/bundle.py add .carry/G3/bundle-*-2of3 || exit 1
[ -d .carry/S20ck ] && { python3 benchmarks/bundle.py add .carry/S20ck/bundle-* --store /tmp/ckstore || exit 1; }
tail -n 8 /tmp/mini/lease.log
