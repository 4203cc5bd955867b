#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch/run.h"

int ptrain::test::run_catch(int argc, char** argv) { return Catch::Session().run(argc, argv); }
