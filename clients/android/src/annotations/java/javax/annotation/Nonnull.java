package javax.annotation;

import java.lang.annotation.Documented;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;

/**
 * Compile-only stand-in for JSR-305's {@code javax.annotation.Nonnull} (the same name, so Kotlin
 * and the IDEs read the library's nullability): the library is built with nothing but a JDK, and
 * this class is never packed into the jar. Apps need no jar for it at run time.
 */
@Documented
@Retention(RetentionPolicy.RUNTIME)
public @interface Nonnull {}
