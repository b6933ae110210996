package javax.annotation;

import java.lang.annotation.Documented;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;

/**
 * Compile-only stand-in for JSR-305's {@code javax.annotation.Nullable} (see {@link Nonnull}):
 * never packed into the jar.
 */
@Documented
@Retention(RetentionPolicy.RUNTIME)
public @interface Nullable {}
