# call 3: lease 9's run folders (.carry/S14B/rl, 40 MB) into /tmp/mini, for the daemon; then watch. Its cut benches
# stay behind: their turns were judged on lease 9's loaded host.
mkdir -p /tmp/mini/rl && cp -r .carry/S14B/rl/* /tmp/mini/rl/ || exit 1
gunzip -f /tmp/mini/rl/*/final/tokenizer.json.gz
(cd /tmp/mini/rl && sha256sum */final/adapter_model.safetensors) | sed 's#/final/adapter_model.safetensors##'
touch /tmp/mini/S14B.ok
bash /tmp/repo/.carry/S15/watch.sh ${1:-500}
