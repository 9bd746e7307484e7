# Build speed on 2 cores: ccache when installed, one LibTorch precompiled header reused by every
# target that includes <torch/torch.h> in a .cpp (headers never include it).
find_program(TESSERA_CCACHE ccache)
if(TESSERA_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # pch_defines/time_macros: let ccache cache TUs compiled against the precompiled header.
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${TESSERA_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()

# tessera_use_torch_pch(<target>): compile <target> against the shared <torch/torch.h> PCH.
function(tessera_use_torch_pch target)
  if(TESSERA_PCH AND TARGET tessera_torch_pch)
    target_precompile_headers(${target} REUSE_FROM tessera_torch_pch)
  endif()
endfunction()
