#!/usr/bin/env bash
# Fails when our fork of fuser (vendor/fuser) changed without a new version.
#
# Cargo extracts a registry crate once per name and version under $CARGO_HOME/registry/src and
# reuses that copy. The dry-run publish (scripts/test.sh) packages the fork into a registry at a
# path of the clone's, so a clone at a path seen before (a CI machine's) builds shardfs against
# the fork as it was packaged there last, not as it is: a change of the fork with its version
# unchanged fails there as if the change were missing (`no field io_uring on fuser::Config`), and
# a registry would refuse it anyway. Every change of the fork bumps `0.18.0-shardfs.N`.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' vendor/fuser/Cargo.toml | head -1)
status=0
for extracted in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"shardfs-fuser-$version"; do
  [ -d "$extracted" ] || continue
  if ! diff -rq vendor/fuser/src "$extracted/src" > /dev/null; then
    echo "check_fork_version: vendor/fuser differs from shardfs-fuser $version as packaged before" \
      "($extracted): give the fork a new version (vendor/fuser/Cargo.toml and the crate's" \
      "fuser dependency)" >&2
    status=1
  fi
done
exit $status
