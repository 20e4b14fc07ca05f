# Shared by the benchmark scripts (sourced, not run): waiting for a port, the test certificate.

wait_port() { # port: return once 127.0.0.1:port accepts connections; exit after 10 s
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "port $1 never opened" >&2
  exit 1
}

make_cert() { # dir: a self-signed ECDSA P-256 certificate for localhost, dir/cert.pem and dir/key.pem
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj /CN=localhost \
    -keyout "$1/key.pem" -out "$1/cert.pem" 2>/dev/null
}

ab_config() { # dir mode: dir/portico.toml for the A/B scripts, one listener on 127.0.0.1:9743
  # (TLS 1.3 with X25519 unless mode is http) proxying to the origin on 127.0.0.1:9380, with
  # AB_LISTENER_TOML (or the file AB_LISTENER_TOML_FILE, for text too long for the environment)
  # inside the listener's table (keys such as ip_rules), and AB_EXTRA_TOML appended.
  local tls=""
  if [ "$2" != http ]; then
    tls="[listeners.tls]
certificates = [{ cert = \"$1/cert.pem\", key = \"$1/key.pem\" }]
versions = \"1.3\"
groups = [\"X25519\"]"
  fi
  cat > "$1/portico.toml" <<EOF
[[listeners]]
name = "ab"
address = "127.0.0.1:9743"
${AB_LISTENER_TOML:-}
$(if [ -n "${AB_LISTENER_TOML_FILE:-}" ]; then cat "$AB_LISTENER_TOML_FILE"; fi)
[listeners.limits]
max_connections = 100000
max_requests_per_connection = 0
$tls
[listeners.http2]
max_concurrent_streams = 128
[[listeners.routes]]
proxy = "origin"
[upstreams.origin]
servers = ["127.0.0.1:9380"]
keepalive = 1024
${AB_EXTRA_TOML:-}
EOF
}

nginx_temp_paths() { # dir: nginx's temporary file paths under dir (inside an http block)
  local t
  for t in client_body proxy fastcgi uwsgi scgi; do
    echo "  ${t}_temp_path $1/nginx/$t;"
  done
}

median_range() { # values...: "median (min..max)" (with an even count, the lower middle value)
  printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)] " (" v[1] ".." v[NR] ")"}'
}

alternate_rounds() { # rounds run_fn unit item...: each item in turn, `rounds` times over
  # run_fn ITEM prints its figure, then the rest of its line; a line per run, then each item's
  # median_range (a run that prints nothing stops the script).
  local rounds=$1 run=$2 unit=$3 r item figure rest
  shift 3
  local -A all=()
  for r in $(seq "$rounds"); do
    for item in "$@"; do
      read -r figure rest < <("$run" "$item") || true
      [ -n "${figure:-}" ] || { echo "no figure for $item" >&2; exit 1; }
      echo "round $r $item: $figure $unit${rest:+ $rest}"
      all[$item]="${all[$item]:-} $figure"
    done
  done
  for item in "$@"; do
    # shellcheck disable=SC2086
    echo "median $item: $(median_range ${all[$item]}) $unit"
  done
}
