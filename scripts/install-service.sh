#!/usr/bin/env bash
# Installs warrend as a systemd service (as root; with sudo if not root). Idempotent.
#
#   scripts/install-service.sh [--group NAME] [--dry-run]
#
# - copies target/release/{warren,warrend,warren-agent} to /usr/local/bin (build first);
# - installs docs/examples/network.toml as /etc/warren/network.toml unless one is there;
# - writes /etc/systemd/system/warrend.service (options in /etc/default/warrend, WARREND_ARGS)
#   and /etc/logrotate.d/warren (for the file log of a daemon started by scripts/up.sh);
# - with --group NAME, makes the API socket /run/warren/warren.sock owned by that group (mode
#   0660; the group is created when missing), so its members use warren without root;
# - enables and starts the service.
# --dry-run prints the files it would write and changes nothing. See docs/operations.md.
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh

GROUP="" DRY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --group) GROUP="${2:?--group needs a name}"; shift 2 ;;
        --group=*) GROUP="${1#--group=}"; shift ;;
        --dry-run) DRY=1; shift ;;
        *) echo "install-service: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $DRY -eq 1 ]] || require_root

log() { echo "install-service: $*"; }

BIN=/usr/local/bin
UNIT=/etc/systemd/system/warrend.service
NET=/etc/warren/network.toml

unit() {
    cat << EOT
# Installed by Warren's scripts/install-service.sh; see docs/operations.md.
[Unit]
Description=Warren node daemon (sandboxes for RL agents)
Documentation=file://$PWD/docs/operations.md
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
EnvironmentFile=-/etc/default/warrend
ExecStart=$BIN/warrend --socket /run/warren/warren.sock --state-dir /var/lib/warren --network-config $NET${GROUP:+ --socket-group $GROUP} \$WARREND_ARGS
# Sandboxes live in their own cgroups and outlive the daemon by design: a stop or restart
# must not kill them (the next start re-adopts them).
KillMode=process
Restart=on-failure
RestartSec=2
LimitNOFILE=1048576
TasksMax=infinity

[Install]
WantedBy=multi-user.target
EOT
}

logrotate() {
    cat << 'EOT'
# Installed by Warren's scripts/install-service.sh: the file log of a daemon started by
# scripts/up.sh or `warren up --detach` (a systemd service logs to the journal instead).
/var/log/warren/*.log {
    weekly
    rotate 8
    maxsize 100M
    compress
    delaycompress
    missingok
    notifempty
    copytruncate
}
EOT
}

if [[ $DRY -eq 1 ]]; then
    echo "# $UNIT"
    unit
    echo "# /etc/logrotate.d/warren"
    logrotate
    exit 0
fi

for b in warren warrend warren-agent; do
    [[ -x target/release/$b ]] || { echo "install-service: target/release/$b is missing; run cargo build --release" >&2; exit 1; }
done
log "installing warren, warrend, warren-agent into $BIN"
install -m 755 target/release/warren target/release/warrend target/release/warren-agent "$BIN/"
if [[ ! -e "$NET" ]]; then
    log "installing the example network configuration as $NET"
    install -D -m 644 docs/examples/network.toml "$NET"
fi
if [[ -n "$GROUP" ]] && ! getent group "$GROUP" > /dev/null; then
    log "creating group $GROUP"
    groupadd --system "$GROUP"
fi
unit > "$UNIT"
[[ -d /etc/logrotate.d ]] && logrotate > /etc/logrotate.d/warren
log "wrote $UNIT"
if command -v systemctl > /dev/null && [[ -d /run/systemd/system ]]; then
    systemctl daemon-reload
    systemctl enable --now warrend
    log "warrend is enabled and running: systemctl status warrend; journalctl -u warrend"
else
    log "systemd is not running on this host: start it with $BIN/warrend ... or scripts/up.sh"
fi
