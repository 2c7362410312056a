# Writes help2man's include file for `man sympool`: a COMMANDS section with each subcommand's own
# --help text (verbatim), so the page lists every option the program takes and cannot drift from
# it, and an ENVIRONMENT section pointing at `sympool info`.
#   cmake -DSYMPOOL_CLI=path/to/sympool -DOUT=path/to/sympool.h2m -P man_include.cmake
set(text "[COMMANDS]\n")
foreach(cmd info replay plot summary)
  execute_process(COMMAND ${SYMPOOL_CLI} ${cmd} --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SYMPOOL_CLI} ${cmd} --help failed (${rc})")
  endif()
  # roff: a backslash is written \e, a minus \- (else a hyphen, which pasted options lack); a
  # line starting with . or ' would be a request.
  string(REPLACE "\\" "\\e" help "${help}")
  string(REPLACE "-" "\\-" help "${help}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" help "${help}")
  string(APPEND text ".SS \"sympool ${cmd}\"\n.nf\n${help}.fi\n")
endforeach()
string(APPEND text "[ENVIRONMENT]\n"
  "The SYMPOOL_* variables configure the library; \\fBsympool info\\fR lists every one with its "
  "value, default and source (\\fBsympool info \\-\\-json\\fR as JSON).\n")
file(WRITE ${OUT} "${text}")
