/*
 * config-impl.h — internals shared by the config subsystem's files (schema.c, config.c,
 * write.c). Not for use outside engine/config.
 */
#ifndef JDT_CONFIG_IMPL_H
#define JDT_CONFIG_IMPL_H

#include "config/config.h"

/* NULL-terminated section names, in schema order. */
extern const char *const JDT_CONFIG_SECTIONS[];

/* Index of k in the schema table (0 <= index < jdt_config_schema_count()). */
int jdt_config_key_index(const jdt_config_key *k);

/* Writes what a key accepts ("a|b|c", ">= 1", "[0, 1)", ...) into buf ("" when anything). */
void jdt_config_key_expect(const jdt_config_key *k, char *buf, size_t n_bytes);

#endif /* JDT_CONFIG_IMPL_H */
