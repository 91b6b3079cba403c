export {
  canSwitchUsers,
  type RecordedUser,
  removeServiceUsersOf,
  SERVICE_USER_COMMENT,
  SERVICE_USER_PREFIX,
  ServiceUsers,
  serviceUserName,
  WORKLOAD_ID_RANGE,
  type WorkloadUser,
} from "./accounts";
export { asWorkloadUser, credentialsArg } from "./exec";
export {
  dataDirModes,
  describeModeChange,
  firstClosedParent,
  firstUnreachableBy,
  type ModeChange,
  modeChangesSince,
  secureDataDir,
  spreadServiceTrees,
  tightened,
} from "./layout";
