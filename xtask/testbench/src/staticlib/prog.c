/*
 * A C program linking libgdrapi.a beside another Rust staticlib (other.rs), built and run by
 * cargo xtask's libgdrapi.a check (xtask/testbench/src/staticlib.rs). Each library runs on its own std.
 */
#include <stdio.h>

#include <gdrapi.h>

int other_rust_answer(void);

int main(void)
{
	int major = -1, minor = -1;
	gdr_t g;

	gdr_runtime_get_version(&major, &minor);
	/* gdrapi's std at work (environment, files, locks, allocation); NULL without the module. */
	g = gdr_open();
	if (g)
		gdr_close(g);
	printf("gdr_runtime_get_version %d.%d\n", major, minor);
	printf("other_rust_answer %d\n", other_rust_answer());
	return 0;
}
