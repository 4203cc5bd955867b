// The entry point of the test programs that run every test they are given.
#include "catch/run.h"

int main(int argc, char** argv) { return ptrain::test::run_catch(argc, argv); }
