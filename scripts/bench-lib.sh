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
