#!/usr/bin/env bash
# Build a Debian package of Portico: the stripped binary, /etc/portico/portico.toml (a conffile),
# the systemd unit, the man page and shell completions, a `portico` system user made on install.
#   scripts/package-deb.sh                      # release build, package in target/deb/
#   scripts/package-deb.sh --binary PATH        # package an existing binary (the tests use the debug one)
#   scripts/package-deb.sh --out DIR --compress gzip   # xz (the default), gzip or none
# Needs dpkg-deb and binutils (strip), both on every Debian system.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=""
out="target/deb"
compress="xz"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --compress) compress="$2"; shift 2 ;;
    *) echo "usage: $0 [--binary PATH] [--out DIR] [--compress xz|gzip|none]" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  cargo build --release --locked -p portico
  bin="target/release/portico"
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
arch="$(dpkg --print-architecture)"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"

install -d "$root/DEBIAN" "$root/usr/bin" "$root/etc/portico" "$root/lib/systemd/system" \
  "$root/usr/share/man/man1" "$root/usr/share/bash-completion/completions" \
  "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d" \
  "$root/usr/share/doc/portico"
install -m 0755 "$bin" "$root/usr/bin/portico"
strip --strip-all "$root/usr/bin/portico"
install -m 0644 packaging/portico.toml "$root/etc/portico/portico.toml"
install -m 0644 packaging/portico.service "$root/lib/systemd/system/portico.service"
install -m 0644 packaging/portico.socket "$root/lib/systemd/system/portico.socket"
"$root/usr/bin/portico" man --dir "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1
"$root/usr/bin/portico" completions bash > "$root/usr/share/bash-completion/completions/portico"
"$root/usr/bin/portico" completions zsh > "$root/usr/share/zsh/vendor-completions/_portico"
"$root/usr/bin/portico" completions fish > "$root/usr/share/fish/vendor_completions.d/portico.fish"
for doc in README.md docs/configuration.md docs/operations.md; do
  gzip -9n < "$doc" > "$root/usr/share/doc/portico/$(basename "$doc").gz"
done
chmod 0644 "$root"/usr/share/*/*/* "$root"/usr/share/*/*/*/* 2>/dev/null || true

size_kb="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
cat > "$root/DEBIAN/control" <<CONTROL
Package: portico
Version: $version
Architecture: $arch
Maintainer: Portico developers <portico@localhost>
Installed-Size: $size_kb
Depends: libc6 (>= 2.31), passwd
Section: httpd
Priority: optional
Homepage: https://github.com/portico-proxy/portico
Description: reverse proxy with its origin server and benchmark in one binary
 Portico is an HTTP/1.1, HTTP/2 and TLS reverse proxy and load balancer:
 routing, health checks, retries, rate limits, compression, access control,
 Prometheus metrics and a dashboard, reloads that lose no request. The same
 binary runs a static-file origin and an open-loop benchmark (portico bench).
CONTROL
echo "/etc/portico/portico.toml" > "$root/DEBIAN/conffiles"

cat > "$root/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  if ! getent passwd portico >/dev/null; then
    useradd --system --user-group --no-create-home --home-dir /var/lib/portico \
      --shell /usr/sbin/nologin --comment "Portico reverse proxy" portico
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
  fi
  if [ -n "${2:-}" ] && [ -d /run/systemd/system ] && systemctl is-active --quiet portico.service; then
    if dpkg --compare-versions "$2" ge 0.2.0; then
      # An upgrade of a running service: the new binary takes the listening sockets (SIGUSR2),
      # no connection is refused; if it fails, the old process serves on and says so in the
      # journal. (Versions before 0.2.0 have no SIGUSR2 handler: it would kill them.)
      pid="$(systemctl show -p MainPID --value portico.service)"
      [ -z "$pid" ] || [ "$pid" = 0 ] || kill -USR2 "$pid" || true
    else
      systemctl try-restart portico.service || true
    fi
  elif [ -z "${2:-}" ]; then
    echo "portico: edit /etc/portico/portico.toml, then: systemctl enable --now portico"
  fi
fi
SCRIPT
cat > "$root/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
  systemctl stop portico.service >/dev/null 2>&1 || true
fi
SCRIPT
cat > "$root/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$1" = purge ]; then
  rm -rf /var/lib/portico /var/log/portico
fi
SCRIPT
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/portico_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compress" --build "$root" "$deb" >/dev/null
echo "$deb"
