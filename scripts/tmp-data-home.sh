# Sourced (bash) by the test scripts: gives the run a temporary XDG_DATA_HOME, because stores
# opened with role auto and no data_dir are durable under $XDG_DATA_HOME/kalos/<name> (or
# ~/.local/share/kalos/<name>) and a test run must not write into the user's data directory.
#
#   source scripts/tmp-data-home.sh
#   tmp_data_home_begin          # exports XDG_DATA_HOME=<new temporary directory>
#   ...run the tests...
#   tmp_data_home_end            # removes it; fails (status 1) if the user's own kalos data
#                                # directory gained an entry during the run
#
# tmp_data_home_end is idempotent, so callers can run it both at the end and from an EXIT trap.

tmp_data_home_begin() {
  # The directory the library would use without the override (src/config.rs: an absolute
  # XDG_DATA_HOME, else $HOME/.local/share).
  local base=${XDG_DATA_HOME:-}
  [[ $base == /* ]] || base=${HOME:-/nonexistent}/.local/share
  TMP_DATA_HOME_USER_DIR=$base/kalos
  TMP_DATA_HOME_BEFORE=$(ls -A "$TMP_DATA_HOME_USER_DIR" 2>/dev/null | sort || true)
  XDG_DATA_HOME=$(mktemp -d "${TMPDIR:-/tmp}/kalos-xdg.XXXXXX")
  export XDG_DATA_HOME
  TMP_DATA_HOME_DIR=$XDG_DATA_HOME
}

tmp_data_home_end() {
  [[ -n ${TMP_DATA_HOME_DIR:-} ]] || return 0
  rm -rf "$TMP_DATA_HOME_DIR"
  TMP_DATA_HOME_DIR=
  local after new
  after=$(ls -A "$TMP_DATA_HOME_USER_DIR" 2>/dev/null | sort || true)
  new=$(comm -13 <(printf '%s\n' "$TMP_DATA_HOME_BEFORE") <(printf '%s\n' "$after") | sed '/^$/d' || true)
  if [[ -n $new ]]; then
    echo "the run left these stores in $TMP_DATA_HOME_USER_DIR (a test ignores XDG_DATA_HOME):" >&2
    echo "$new" >&2
    return 1
  fi
}
