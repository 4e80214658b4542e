# The vendored liburing (third_party/liburing/VENDORED.md), built as a static library and
# linked into jaxoff_engine: the io_uring backend without a system liburing. Included from
# ffi/CMakeLists.txt when no system liburing is found (or -DJAXOFF_URING_VENDORED=ON).
# Sets JAXOFF_URING_VENDORED_BUILT.
set(JAXOFF_URING_VENDORED_BUILT OFF)
include(CheckLanguage)
check_language(C)
if(CMAKE_C_COMPILER)
  enable_language(C)
  set(_uring_dir ${CMAKE_CURRENT_BINARY_DIR}/liburing)
  file(REMOVE_RECURSE ${_uring_dir})
  file(COPY ${CMAKE_CURRENT_LIST_DIR}/liburing/ DESTINATION ${_uring_dir})
  # configure writes config-host.h and compat.h for this machine's kernel headers
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env CC=${CMAKE_C_COMPILER} sh ./configure --use-libc
    WORKING_DIRECTORY ${_uring_dir}
    RESULT_VARIABLE _uring_rc
    OUTPUT_VARIABLE _uring_log
    ERROR_VARIABLE _uring_log)
  if(_uring_rc EQUAL 0 AND EXISTS ${_uring_dir}/config-host.h)
    # configure asks make for the version; the header is written here so make is not needed
    file(STRINGS ${_uring_dir}/liburing.spec _uring_version REGEX "^Version:")
    string(REGEX MATCH "([0-9]+)\\.([0-9]+)" _uring_version "${_uring_version}")
    file(WRITE ${_uring_dir}/src/include/liburing/io_uring_version.h
         "#ifndef LIBURING_VERSION_H\n#define LIBURING_VERSION_H\n"
         "#define IO_URING_VERSION_MAJOR ${CMAKE_MATCH_1}\n"
         "#define IO_URING_VERSION_MINOR ${CMAKE_MATCH_2}\n#endif\n")
    set(_uring_src ${_uring_dir}/src)
    add_library(jaxoff_uring STATIC
      ${_uring_src}/setup.c ${_uring_src}/queue.c ${_uring_src}/register.c
      ${_uring_src}/syscall.c ${_uring_src}/version.c)
    target_include_directories(jaxoff_uring PUBLIC ${_uring_src}/include)
    target_include_directories(jaxoff_uring PRIVATE ${_uring_src})
    target_compile_definitions(jaxoff_uring PRIVATE
      _GNU_SOURCE _LARGEFILE_SOURCE _FILE_OFFSET_BITS=64 LIBURING_INTERNAL)
    target_compile_options(jaxoff_uring PRIVATE
      -include ${_uring_dir}/config-host.h -O2 -Wno-unused-parameter)
    # its symbols stay inside jaxoff's modules (a system liburing elsewhere in the process
    # is not bound to them)
    set_target_properties(jaxoff_uring PROPERTIES C_VISIBILITY_PRESET hidden)
    set(JAXOFF_URING_VENDORED_BUILT ON)
  else()
    string(REGEX REPLACE "\n" " " _uring_log "${_uring_log}")
    message(WARNING "jaxoff: the vendored liburing did not configure: ${_uring_log}")
  endif()
else()
  message(WARNING "jaxoff: no C compiler for the vendored liburing")
endif()
