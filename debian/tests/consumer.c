/* A consumer of gdrapi.h: the library's version, and whether gdr_open reaches the driver. */
#include <gdrapi.h>
#include <stdio.h>

int main(void)
{
	int major = 0, minor = 0;
	gdr_t g;

	gdr_runtime_get_version(&major, &minor);
	printf("libgdrapi %d.%d\n", major, minor);
	g = gdr_open();
	printf("gdr_open: %s\n", g ? "ok" : "failed");
	if (g)
		gdr_close(g);
	return 0;
}
