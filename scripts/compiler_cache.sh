# Sourced by setup.sh and sanitize.sh: with ccache installed every compile goes through it, keyed
# on paths relative to the checkout ($root), so a second checkout (CI's clean one, a worktree)
# reuses the first's objects. It takes effect at a build folder's first configure; one configured
# before keeps its compilers. Without ccache nothing changes.
if command -v ccache > /dev/null; then
  for lang in C CXX CUDA; do
    var="CMAKE_${lang}_COMPILER_LAUNCHER"
    export "$var=${!var:-ccache}"
  done
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi
